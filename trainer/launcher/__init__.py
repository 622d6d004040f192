"""The pod-side launcher (`kubeddp launch`, `kubeddp train`): plan the rendezvous from the env,
wait for its host, serve the pod's /metrics, and run torchrun's agent, which starts the workers.
"""
