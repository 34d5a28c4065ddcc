"""The workspace and its sources: which files are memory, reading them safely, agent transcripts, the starter template.

May use: `text` and the base. Reads the user's files and never writes, moves or deletes one (`template` only
creates files that do not exist yet).
"""
