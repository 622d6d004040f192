"""The script checker: a user's training script read without running it (Python `ast`), its
DDP pitfalls named (`kubeddp check`, and `kubeddp train` before it starts the workers)."""
