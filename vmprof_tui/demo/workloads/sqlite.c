/* sqlite: SQLite (libsqlite3-dev's libsqlite3.a) on bench.db in the program's directory: inserts in
 * transactions, an index, queries, repeated for the given seconds.  Arguments: [seconds, default 0: until stopped; -N: N rounds]. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include "common.h"

static int run(sqlite3 *db, const char *sql)
{
	char *err = NULL;
	if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
		fprintf(stderr, "sqlite: %s: %s\n", sql, err ? err : "?");
		sqlite3_free(err);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 0;
	sqlite3 *db;
	if (sqlite3_open("bench.db", &db) != SQLITE_OK) {
		fprintf(stderr, "sqlite: cannot open bench.db: %s\n", sqlite3_errmsg(db));
		return 1;
	}
	if (run(db, "DROP TABLE IF EXISTS t; CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT)"))
		return 1;
	sqlite3_stmt *ins, *sel;
	sqlite3_prepare_v2(db, "INSERT INTO t(k, v) VALUES(?, ?)", -1, &ins, NULL);
	sqlite3_prepare_v2(db, "SELECT count(*), sum(length(v)) FROM t WHERE k BETWEEN ? AND ?", -1, &sel, NULL);
	unsigned long x = 1;
	long rows = 0, found = 0;
	int rounds = 0;
	double end = now() + seconds;
	do {
		run(db, "BEGIN");
		for (int i = 0; i < 2000; i++) {
			x = x * 6364136223846793005UL + 1442695040888963407UL;
			char v[64];
			snprintf(v, sizeof v, "value %lu of round %d", x >> 40, rounds);
			sqlite3_bind_int64(ins, 1, (sqlite3_int64)(x >> 44));
			sqlite3_bind_text(ins, 2, v, -1, SQLITE_TRANSIENT);
			sqlite3_step(ins);
			sqlite3_reset(ins);
			rows++;
		}
		run(db, "COMMIT");
		if (rounds == 0)
			run(db, "CREATE INDEX tk ON t(k)");
		for (int q = 0; q < 200; q++) {
			x = x * 6364136223846793005UL + 1442695040888963407UL;
			sqlite3_int64 lo = (sqlite3_int64)(x >> 44);
			sqlite3_bind_int64(sel, 1, lo);
			sqlite3_bind_int64(sel, 2, lo + 5000);
			if (sqlite3_step(sel) == SQLITE_ROW)
				found += sqlite3_column_int64(sel, 0);
			sqlite3_reset(sel);
		}
		rounds++;
	} while (more(seconds, end, rounds));
	sqlite3_finalize(ins);
	sqlite3_finalize(sel);
	sqlite3_close(db);
	printf("sqlite: %d rounds, %ld rows, %ld found\n", rounds, rows, found);
	return 0;
}
