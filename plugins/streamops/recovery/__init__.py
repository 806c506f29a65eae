"""Recovery for on-call: restart a crashed app, reset its input position, replay dead letters,
rebuild its state, restore a checkpoint snapshot. Each is plan -> apply -> verify, audited.

Spark keeps an app's input position in its checkpoint, not in a consumer group, so Kafka's own
reset tools do nothing to it: every recovery here works on the checkpoint, always after a backup.
"""
