"""The floor of any relay on this machine, for bench/egress.sh: a bare
splice(2) relay on the host's loopback (no sandbox, no policy, no agent),
forwarding 127.0.0.1:PORT to DEST:DPORT. A download through it crosses one
loopback TCP hop more than the direct one, as the egress relay's does.

usage: splice_relay.py DEST DPORT PORT
"""

import fcntl
import os
import socket
import sys
import threading

F_SETPIPE_SZ = 1031
CHUNK = 1 << 20


def pump(src: socket.socket, dst: socket.socket) -> None:
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, CHUNK)
    try:
        while n := os.splice(src.fileno(), w, CHUNK):
            while n:
                n -= os.splice(r, dst.fileno(), n)
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def main() -> None:
    dest, dport, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    listener = socket.create_server(("127.0.0.1", port))
    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection((dest, dport))
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()


if __name__ == "__main__":
    main()
