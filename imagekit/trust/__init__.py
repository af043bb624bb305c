"""Another party's data: untrusted input checked, values validated, credentials redacted."""
