"""`tide serve`, `tide worker`, `tide keys` (owned by the service work, issue 5)."""


def register(sub) -> None:
    return None
