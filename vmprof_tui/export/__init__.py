"""Output formats of `vmprof report`: one module per format, each with render(profile, ...) -> str | bytes."""

FORMATS = ("table", "json", "csv", "collapsed", "pprof", "chrome")
