"""The checkpoint keeper: the one pod that mounts the checkpoint claim (server, store,
uploads, protocol, auth, sizing) and each training pod's side of it (client, sync, reach)."""
