"""The training step inside other training loops: a DDP communication hook
(:mod:`~gtopk_lab.integrations.ddp_hook`) and wait-free backpropagation
(:mod:`~gtopk_lab.integrations.overlap`)."""
