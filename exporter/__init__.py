"""llm-bench-exporter: a strict measuring proxy for LLM serving benchmarks."""

__version__ = "0.1.0"
