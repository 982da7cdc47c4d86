"""Where the metrics go: the Prometheus collector and its HTTP server (TLS, basic auth), OTLP push."""
