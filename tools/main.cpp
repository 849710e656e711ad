#include <cstdio>
int main() { std::puts("dsmla"); return 0; }
