"""The sockets an epoch's torch Gloo groups connected, found from /proc (Linux).

The driver arms them with ``_resilience.arm_epoch_sockets`` so that launch's SIGURG for a
failed epoch ends every torch collective blocked in it at once (python/src/epoch_sockets.hpp).
A torch Gloo group's connections are the TCP connections that exist after the epoch's
``init_process_group`` and ``new_group`` calls and did not before, less those to or from a
store's port (the epoch's TCPStore and its clients, the job's store)."""

import os
import re

_STATES = ("/proc/net/tcp", "/proc/net/tcp6")
_ESTABLISHED = "01"
_SOCKET = re.compile(r"socket:\[(\d+)\]")


def socket_inodes():
    """{inode: fd} of this process's sockets; {} where /proc cannot say."""
    found = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            m = _SOCKET.fullmatch(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue  # closed meanwhile (or the listing's own descriptor)
        if m:
            found[int(m.group(1))] = int(name)
    return found


def _connections():
    """{inode: (local port, remote port)} of the established TCP connections this network
    namespace holds."""
    out = {}
    for path in _STATES:
        try:
            with open(path) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _ESTABLISHED:
                continue
            local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
            out[int(fields[9])] = (int(local, 16), int(remote, 16))
    return out


def new_connections(before, store_ports):
    """The descriptors of the established TCP connections opened since ``before`` (a
    ``socket_inodes()``), except those whose local or remote port is in ``store_ports``."""
    now = socket_inodes()
    established = _connections()
    fds = []
    for inode, fd in now.items():
        if inode in before or inode not in established:
            continue
        local, remote = established[inode]
        if local in store_ports or remote in store_ports:
            continue
        fds.append(fd)
    return sorted(fds)


def ports_of(uri):
    """The ports named in a store URI ("tcp://h:p", "etcd://h:p,h:p"); empty for others."""
    return {int(p) for p in re.findall(r":(\d+)(?=[,/]|$)", uri)}
