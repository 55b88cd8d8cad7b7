"""gtopk_lab.compression"""
