"""The one collective logger: wrappers, DDP and NCCL hooks, in-flight and hang state, trace writing, the link probe."""
