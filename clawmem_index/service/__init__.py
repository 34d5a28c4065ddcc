"""The daemon's service: the process (`daemon`), its writer and embedding threads, the file watcher, the socket
server and its JSON-RPC protocol, the socket client, systemd notification and units.

May use: `engine` and everything below it.
"""
