"""The Hugging Face Hub and the local model store: search, fit, pull, the cache, starter models."""
