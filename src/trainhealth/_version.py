"""The package version, importable without loading anything else."""

__version__ = "0.1.0"
