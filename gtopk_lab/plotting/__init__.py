"""gtopk_lab.plotting"""
