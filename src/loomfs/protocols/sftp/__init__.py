"""The SFTP server (protocol layer): SSH public-key logins, SFTP over the namespace API."""

from .server import SftpServer

__all__ = ["SftpServer"]
