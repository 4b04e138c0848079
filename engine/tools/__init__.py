"""Engine tools above the serving path: llama-bench style benchmarks and perplexity."""
