"""The graph IR: symbolic dims, nodes and graphs, the op catalogue and verifier, and the graph's forms
(canonical text and JSON, structural hash, diff, DOT, a networkx view).
"""
