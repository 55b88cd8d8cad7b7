"""gtopk_lab.network"""
