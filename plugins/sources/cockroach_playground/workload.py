"""The playground's shop workload: customers, products and orders under inserts, updates and deletes."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from cdcflow.plugins.sources.cockroach_playground.sql import Session, SQLError
from cdcflow.plugins.sources.cockroach_playground.store import Store

__all__ = ["SHOP_DDL", "Workload", "WorkloadStats"]

SHOP_DDL = (
    "CREATE TABLE IF NOT EXISTS customers (id INT8 PRIMARY KEY, name STRING(64) NOT NULL, email STRING(128), "
    "balance DECIMAL(12,2) NOT NULL DEFAULT 0, vip BOOL NOT NULL DEFAULT false, created_at TIMESTAMP NOT NULL, "
    "profile JSONB)",
    "CREATE TABLE IF NOT EXISTS products (id INT8 PRIMARY KEY, sku STRING(32) NOT NULL, price DECIMAL(10,2) NOT NULL, "
    "stock INT4 NOT NULL, weight FLOAT8, updated_at TIMESTAMPTZ NOT NULL, image BYTES)",
    "CREATE TABLE IF NOT EXISTS orders (id INT8 PRIMARY KEY, customer_id INT8 NOT NULL, product_id INT8 NOT NULL, "
    "quantity INT4 NOT NULL, amount DECIMAL(12,2) NOT NULL, status STRING(16) NOT NULL, placed_on DATE NOT NULL)",
)


@dataclass
class WorkloadStats:
    transactions: int = 0
    rows: int = 0
    ddls: int = 0


class Workload:
    """Transactions at ``rate`` per second on a thread, deterministic for a seed."""

    def __init__(self, store: Store, *, rate: float, seed: int = 0) -> None:
        self.store = store
        self.rate = rate
        self.random = random.Random(seed)
        self.stats = WorkloadStats()
        self.session = Session(store)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next = {"customers": 1, "products": 1, "orders": 1}

    def start(self, rate: float | None = None) -> None:
        """Run transactions at ``rate`` (default: the constructor's) until :meth:`stop`; again after a stop."""
        if rate is not None:
            self.rate = rate
        if self.rate <= 0 or (self._thread is not None and self._thread.is_alive()):
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="cockroach-playground-workload", daemon=True)
        self._thread.start()

    def stop(self) -> WorkloadStats:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.stats

    def _run(self) -> None:
        while not self._stop.wait(1.0 / self.rate):
            try:
                self.step()
            except SQLError:
                self.session.execute("ROLLBACK")

    def _insert(self, table: str) -> str:
        r = self.random
        i = self._next[table]
        self._next[table] += 1
        if table == "customers":
            return (
                f"INSERT INTO customers (id, name, email, balance, vip, created_at, profile) VALUES ({i}, "
                f"'customer {i}', {'NULL' if r.random() < 0.2 else repr(f'c{i}@shop.test')}, "
                f"{r.randint(0, 100000) / 100:.2f}, {str(r.random() < 0.1).lower()}, "
                f"'2024-0{r.randint(1, 9)}-1{r.randint(0, 9)} 10:00:0{r.randint(0, 9)}', "
                f"'{{\"level\": {r.randint(1, 5)}}}'::JSONB)"
            )
        if table == "products":
            return (
                f"INSERT INTO products (id, sku, price, stock, weight, updated_at, image) VALUES ({i}, 'SKU-{i}', "
                f"{r.randint(100, 99999) / 100:.2f}, {r.randint(0, 500)}, {r.random() * 10:.3f}, "
                f"'2024-05-0{r.randint(1, 9)} 12:34:56.{r.randint(0, 999999):06d}+00:00', '\\x{r.randbytes(4).hex()}')"
            )
        return (
            f"INSERT INTO orders (id, customer_id, product_id, quantity, amount, status, placed_on) VALUES ({i}, "
            f"{r.randint(1, max(1, self._next['customers'] - 1))}, {r.randint(1, max(1, self._next['products'] - 1))}, "
            f"{r.randint(1, 5)}, {r.randint(100, 50000) / 100:.2f}, 'new', '2024-06-{r.randint(10, 28)}')"
        )

    def step(self) -> None:
        """One transaction: a few inserts, an update or a delete."""
        r = self.random
        statements: list[str] = []
        for _ in range(r.randint(1, 3)):
            choice = r.random()
            table = r.choice(["customers", "products", "orders"])
            existing = self._next[table] - 1
            if choice < 0.6 or existing < 3:
                statements.append(self._insert(table))
            elif choice < 0.9:
                key = r.randint(1, existing)
                if table == "orders":
                    statements.append(f"UPDATE orders SET status = 'shipped', quantity = quantity + 1 WHERE id = {key}")
                elif table == "products":
                    statements.append(f"UPDATE products SET stock = stock - 1, price = price + 1 WHERE id = {key}")
                else:
                    statements.append(f"UPDATE customers SET balance = balance + 10.5 WHERE id = {key}")
            else:
                statements.append(f"DELETE FROM {table} WHERE id = {r.randint(1, existing)}")
        self.session.execute("BEGIN")
        for statement in statements:
            self.session.execute(statement)
        self.session.execute("COMMIT")
        self.stats.transactions += 1
        self.stats.rows += len(statements)
