"""Lab 3's Python package: the network, its data and its trained weights (lab3.network, lab3.mnist, lab3.train)."""
