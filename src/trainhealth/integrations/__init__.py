"""Attach trainhealth to the trainer you already use: Hugging Face, Lightning, Accelerate, torchtitan.

Each module imports its trainer and checks its version first (docs/integrations.md).
"""
