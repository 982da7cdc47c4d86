"""Small real models for the demo, the benchmarks and the tests."""
