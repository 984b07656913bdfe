"""An exception class of the project's own."""


class PaymentDeclined(Exception):
    pass
