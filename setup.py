"""Build the optional C module mqstore.commitlog._native (metadata lives in pyproject.toml).

The module is optional: where no C compiler is found the install still succeeds and
commitlog/record.py runs its pure-Python versions
(`python -c 'from mqstore.commitlog.native import NATIVE; print(NATIVE)'` says which).
`MQSTORE_REQUIRE_NATIVE=1` makes importing the store fail without it (make test sets it).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mqstore.commitlog._native",
            [
                "commitlog/_native.c",
                "commitlog/_scan.c",
                "commitlog/_appender.c",
                "commitlog/_feed.c",
                "commitlog/_columns.c",
                "commitlog/_dispatch.c",
                "consumequeue/_time.c",
                "segmented/_records.c",
                "mqstore/broker/_kafka_codec.c",
                "mqstore/_put.c",
                "consumequeue/_runs.c",
                "consumequeue/_units.c",
            ],
            depends=["commitlog/_native.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
