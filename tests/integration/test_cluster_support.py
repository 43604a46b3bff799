"""The test cluster itself (tests/support/cluster.py): a start survives a port taken between
its choice and the node's bind, as happens beside parallel workers starting servers."""

from __future__ import annotations

import socket

from tests.support.cluster import NatsCluster


def test_a_node_whose_port_was_taken_has_the_cluster_start_again_on_fresh_ports() -> None:
    """A node's client port is taken by another listener before the start: the node exits
    at once ("address already in use"), and the cluster starts again on fresh ports and
    forms with every node alive. Before, the start went on with two nodes while the squatter
    answered on the dead one's port (seen failing here); with a route or monitoring port
    taken it waited 30 s and failed every cluster test of the session ("nothing listens on
    ... after 30s", seen in a suite run)."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    cluster = NatsCluster()
    cluster.nodes[1].client_port = taken
    try:
        cluster.start(timeout=20)
        assert cluster.nodes[1].client_port != taken
        assert all(node.alive for node in cluster.nodes)
        assert cluster.nodes[1].monitor("/jsz")["meta_cluster"]["cluster_size"] == 3
    finally:
        cluster.stop()
        squatter.close()
