/* lua: the Lua 5.4 interpreter (liblua5.4-dev's liblua5.4.a) running a script of table, string and
 * arithmetic work, repeated for the given seconds.  Arguments: [seconds, default 0: until stopped; -N: N rounds]. */
#include <lua5.4/lauxlib.h>
#include <lua5.4/lua.h>
#include <lua5.4/lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include "common.h"

static const char *SCRIPT =
	"local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end\n"
	"local t = {}\n"
	"for i = 1, 20000 do t[i] = string.format('%d:%s', i * 7 % 1000, string.rep('x', i % 17)) end\n"
	"table.sort(t)\n"
	"local words = {}\n"
	"for _, s in ipairs(t) do local k = s:match('^(%d+)'); words[k] = (words[k] or 0) + #s end\n"
	"local n = 0\n"
	"for _, v in pairs(words) do n = n + v end\n"
	"return n + fib(22)\n";

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 0;
	lua_State *L = luaL_newstate();
	luaL_openlibs(L);
	int rounds = 0;
	long long sum = 0;
	double end = now() + seconds;
	do {
		if (luaL_dostring(L, SCRIPT) != LUA_OK) {
			fprintf(stderr, "lua: %s\n", lua_tostring(L, -1));
			return 1;
		}
		sum += lua_tointeger(L, -1);
		lua_pop(L, 1);
		rounds++;
	} while (more(seconds, end, rounds));
	lua_close(L);
	printf("lua: %d rounds, checksum %lld\n", rounds, sum);
	return 0;
}
