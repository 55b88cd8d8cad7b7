"""gtopk_lab.orchestration"""
