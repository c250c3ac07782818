"""Serving many users from one model: an OpenAI-compatible HTTP server (``graphir serve``) whose requests are
sequences of one context, decoded together by continuous batching (:mod:`graphir.serving.slots`)."""
