"""Attach trainhealth to the trainer you already use: Hugging Face, Lightning, Accelerate, torchtitan."""
