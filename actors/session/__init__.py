"""The Session actor: program lifecycle (load/main/save) and the replica's batch loop."""
