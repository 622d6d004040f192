"""Build-time generators (`make chart`, `make k8s`): files the repository keeps generated.
Not shipped in the wheel: nothing at run time imports them."""
