"""One widget per file; each __init__ calls small _build_… helpers."""
