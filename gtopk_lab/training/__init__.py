"""gtopk_lab.training"""
