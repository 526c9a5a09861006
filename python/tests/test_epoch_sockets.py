"""Ending an epoch's torch connections on launch's signal (python/src/epoch_sockets.hpp,
commgrid/torch/_sockets.py), with real sockets and real signals in this process: SIGURG
queued with the armed epoch shuts the armed sockets down (the peer reads the end), with
another epoch or after disarming it does nothing. The whole path, launch's signal to the
survivors of a SIGKILL, runs in test_resilient_torch.py."""
import ctypes
import os
import select
import signal
import socket

import pytest

_resilience = pytest.importorskip("commgrid._resilience",
                                  reason="commgrid._resilience (the resilient driver's binding) was not built")
from commgrid.torch import _sockets  # noqa: E402

libc = ctypes.CDLL(None, use_errno=True)
libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]


def queue(epoch):
    """What launch does: SIGURG to this process with `epoch` as the signal's value."""
    assert libc.sigqueue(os.getpid(), signal.SIGURG, epoch) == 0, os.strerror(ctypes.get_errno())


def ended(peer, wait_s):
    """Whether `peer` reads the end of its connection within wait_s seconds."""
    ready, _, _ = select.select([peer], [], [], wait_s)
    return bool(ready) and peer.recv(16) == b""


def test_the_signal_is_launchs():
    assert _resilience.EPOCH_FAILURE_SIGNAL == signal.SIGURG


def test_the_armed_epochs_signal_ends_its_connections_and_no_other_does():
    mine, peer = socket.socketpair()
    other_mine, other_peer = socket.socketpair()
    try:
        _resilience.arm_epoch_sockets(8, [mine.fileno()])
        before = _resilience.epoch_sockets_ended()
        queue(7)  # an earlier epoch's failure, told late
        assert not ended(peer, 0.5), "a signal for another epoch ended the connection"
        assert _resilience.epoch_sockets_ended() == before
        queue(8)
        assert ended(peer, 30), "the armed epoch's signal did not end the connection"
        assert _resilience.epoch_sockets_ended() == before + 1
        assert not ended(other_peer, 0.2), "a connection that was not armed was ended"

        _resilience.arm_epoch_sockets(9, [other_mine.fileno()])
        _resilience.disarm_epoch_sockets()
        queue(9)
        assert not ended(other_peer, 0.5), "a disarmed epoch's connection was ended"
        assert _resilience.epoch_sockets_ended() == before + 1
    finally:
        _resilience.disarm_epoch_sockets()
        for s in (mine, peer, other_mine, other_peer):
            s.close()


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="epoch: must be >= 0, got -1"):
        _resilience.arm_epoch_sockets(-1, [])
    with pytest.raises(ValueError, match="fds: at most 4096 sockets, got 4097"):
        _resilience.arm_epoch_sockets(0, list(range(4097)))


def test_the_new_connections_are_found_and_a_stores_are_left_out():
    server = socket.create_server(("127.0.0.1", 0))
    store = socket.create_server(("127.0.0.1", 0))
    before = _sockets.socket_inodes()
    group = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    to_store = socket.create_connection(store.getsockname())
    store_side, _ = store.accept()
    try:
        found = _sockets.new_connections(before, {store.getsockname()[1]})
        assert sorted(found) == sorted([group.fileno(), accepted.fileno()]), found
        # Connections that existed before are not the epoch's.
        assert _sockets.new_connections(_sockets.socket_inodes(), set()) == []
    finally:
        for s in (server, store, group, accepted, to_store, store_side):
            s.close()


def test_a_store_uris_ports():
    assert _sockets.ports_of("tcp://10.0.0.1:29500") == {29500}
    assert _sockets.ports_of("etcd://h1:2379,h2:2380,[::1]:2381") == {2379, 2380, 2381}
    assert _sockets.ports_of("file:///tmp/store") == set()
