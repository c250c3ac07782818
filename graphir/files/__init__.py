"""Model files: GGUF headers (full or header-only), memory-mapped weights, and conversion of Hugging Face
checkpoints to GGUF.
"""
