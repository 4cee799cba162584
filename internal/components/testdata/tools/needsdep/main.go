package main

import _ "example.com/not/in/any/cache"

func main() {}
