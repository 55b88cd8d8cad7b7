"""Analysis (pandas, no plotting): the one scaling-efficiency rule and tables
(:mod:`~gtopk_lab.analysis.scaling`) and alpha-beta(-gamma) predictions over the
registered methods (:mod:`~gtopk_lab.analysis.predict`)."""
