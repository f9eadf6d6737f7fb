"""Deployment: the MQTT broker and its per-role limits, keys and credentials, device fleets, in-process deployments."""
