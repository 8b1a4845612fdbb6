"""What was built, proven: pins, the certificate, the audit, and the loader that checks pins."""
