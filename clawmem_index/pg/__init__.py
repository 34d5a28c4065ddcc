"""Where the PostgreSQL schema's helpers were documented before the package's layers: `clawmem_index.pg.schema`.

The code lives in `clawmem_index.index.pg`; this path stays so scripts written against it keep working.
"""
