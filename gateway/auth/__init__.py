"""Who may connect and what they may do, the same for every protocol: the password file, the
ACL (topic rules and AMQP permissions), RocketMQ AccessKeys, and the authorisation model that
applies them to principals of every protocol (authorize.py)."""

from .acl import Access, Acl, AclError
from .passwords import AuthConfigError, PasswordFile

__all__ = ["Access", "Acl", "AclError", "AuthConfigError", "PasswordFile"]
