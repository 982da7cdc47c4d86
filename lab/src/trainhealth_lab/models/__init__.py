"""Small real models for the lab's corpus (the demo's ``tiny_gpt`` ships with trainhealth._internal.demo)."""
