"""GPU telemetry: the sampler; backends nvml, dcgm and simulated (labelled); the XID watcher."""
