from tests.fixtures.mariadb import mariadb, mysql_database, private_mariadb

__all__ = ["mariadb", "mysql_database", "private_mariadb"]
