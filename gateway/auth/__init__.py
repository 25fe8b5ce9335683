"""Who may connect and what they may do: the password file and the ACL, shared by every
protocol gateway (MQTT CONNECT, AMQP PLAIN)."""

from .acl import Access, Acl, AclError
from .passwords import AuthConfigError, PasswordFile

__all__ = ["Access", "Acl", "AclError", "AuthConfigError", "PasswordFile"]
