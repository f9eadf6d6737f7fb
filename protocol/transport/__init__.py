"""Transport: the channel interface, in-process channels and the MQTT channel."""
