"""Sub-commands of the gtopk-lab CLI; see gtopk_lab.cli."""
