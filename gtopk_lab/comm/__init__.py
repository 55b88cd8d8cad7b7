"""The communication layer: the wire format (one buffer per message), the one recorder of
rounds and bytes, the transport interface with its torch.distributed and in-process
implementations, message schedules, per-rank collective programs (gTop-k, the dense
allreduce, users' tensor programs), Ok-Topk (:mod:`gtopk_lab.comm.oktopk`), CommStats, and
process-group launch helpers. It imports the network layer only for pacing and never the
training or method layers (docs/architecture.md, "The communication layer")."""
