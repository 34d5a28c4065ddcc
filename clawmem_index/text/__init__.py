"""Text handling that does no I/O: Markdown into chunks, tokens, keyword text, storable text, times as answers
show them.

May use: the base (`config`, `errors`, `log`) and libraries. Nothing here opens a file or a connection.
"""
