"""The communication layer: wire format and CommStats, message schedules, per-rank
collective programs, their torch.distributed driver and their in-process driver, Ok-Topk,
and process-group launch helpers. It imports the network layer only for pacing and never
the training or method layers."""
