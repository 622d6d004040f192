"""The command line (`kubeddp ...`) and the same commands as a Python API (`kubeddp.client`)."""
