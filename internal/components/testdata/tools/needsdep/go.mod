module example.com/needsdep

go 1.26

require example.com/not/in/any/cache v1.0.0
