"""Media as llama.cpp's mtmd prepares them for a tower: images (image.py), audio (audio.py)."""
