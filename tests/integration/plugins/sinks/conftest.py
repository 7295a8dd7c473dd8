from tests.fixtures.mariadb import mariadb, mysql_database, private_mariadb
from tests.fixtures.spark import spark

__all__ = ["mariadb", "mysql_database", "private_mariadb", "spark"]
